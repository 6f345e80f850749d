"""Claim groups (gangs): all members reserved in one attempt or none, and the room kept for a
waiter (a group or a single claim) that waited too long. Calls into binding.
"""
