// Command elasticgpu-k8s is Kubernetes' own control plane and kubelet in one
// binary, built from the k8s.io/kubernetes module as a library (the way
// out-of-tree scheduler plugins are built), for elasticgpu's real-cluster tests.
//
// Usage: elasticgpu-k8s <component> [flags]
// where <component> is kube-apiserver, kube-controller-manager, kube-scheduler,
// kubelet or kube-proxy; the flags are the component's own. One binary links once and
// caches as one file; each process still runs exactly one component.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	_ "time/tzdata" // CronJob time zones, as the upstream binaries

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"kube-proxy":              proxy.NewProxyCommand,
}

func usage() {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: %s <component> [flags]\ncomponents: %v\n", os.Args[0], names)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	newCommand, ok := components[os.Args[1]]
	if !ok {
		usage()
		os.Exit(2)
	}
	// The component's cobra command parses os.Args[1:]: drop our subcommand so
	// it sees exactly the flags it would see as its own binary.
	os.Args = append([]string{os.Args[0]}, os.Args[2:]...)
	os.Exit(cli.Run(newCommand()))
}
