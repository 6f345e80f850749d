"""`kubectl egpu`: a kubectl plugin (the `kubectl-egpu` console script) that reads the cluster.

kubectl runs any `kubectl-<name>` it finds on PATH for `kubectl <name>`, passing the rest of
the command line as is. The subcommands, one module each:

    top         per node and card: reserved cores and memory, measured use, health, the claims
    why CLAIM   a claim's phase and reason; for a Pending one, the closest card and what it lacks
                (computed by the allocator, exactly as the controller would place it now)
    plan        `elasticgpu plan`: bind claims offline, with no cluster

`cluster` is the plugin's only user of the Kubernetes API; the subcommands get plain models.
Errors pass through the command line's one boundary (`elasticgpu.user_errors`): one line, exit 2.
"""

from elasticgpu.kubectl_plugin.command import main

__all__ = ["main"]
