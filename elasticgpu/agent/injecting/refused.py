"""How the agent tells a front no: the one exception the injection core raises for a container it
refuses, and the hooks and both fronts (the CRI proxy, the NRI plugin) pass on in their own words.

Its own module so that the data flows one way: `injection` (the decision) raises it, `hooks` (what a
front asks of the core, in `injection`'s types) passes it on as `hooks.Refused`: hooks -> injection
-> refused, and injection never imports hooks (issue 51).
"""

from __future__ import annotations

import grpc


class Refused(Exception):
    """A CreateContainer the agent refuses: the gRPC status kubelet gets, and text for the user.

    kubelet shows `message` as the container's CreateContainerError and retries with backoff,
    so the message says what to fix (FAILED_PRECONDITION) or that it will pass by itself
    (UNAVAILABLE: the agent is still starting).
    """

    def __init__(self, message: str, *, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
