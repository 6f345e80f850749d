"""The edge: the only room that talks to the API server.

`kube` (`KubeApi`: every read, write and watch; third-party errors become `controller.errors`
here), `transport` (its keep-alive HTTP connections), `reachability` (one WARNING when the server
stops answering, one INFO when it is back), `leader` (leader election on a Lease).

May import: the kubernetes client, urllib3, `http`, `elasticgpu.api`, the controller's `settings`,
`errors` and `metrics`. Never: the decisions, the picture, the flow, the pods, the process (the
edge receives and returns plain bodies).
"""
