"""Elastic work on Bound claims: resizing in place and recommending sizes from measured use. Calls
into binding.
"""
