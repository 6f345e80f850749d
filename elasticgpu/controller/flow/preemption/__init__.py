"""Priority and preemption: the victims of a claim that fits nowhere, marked, evicted and failed,
with the plan in the preemptor's status. Calls into binding.
"""
