"""Binding: a claim reserved on cards (the commit point), its ElasticGPU made and both bound; its
status writes, its release on deletion. It knows nothing of claim groups or preemption, which call
into it; `reserving` asks them through its own Protocols (`Preempting`, `RoomKeeping`).
"""
