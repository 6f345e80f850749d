"""The watch machinery: lists and watches feeding the picture, the work queue, Events, what a failed
sync does, the hand-off pool and liveness. It knows no behaviour: it imports no other room of the flow.
"""
