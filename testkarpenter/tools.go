//go:build tools

// Package tools pins Karpenter's KWOK provider (sigs.k8s.io/karpenter/kwok) in go.mod and go.sum
// so that build.sh can build that upstream main with -mod=readonly.
package tools

import _ "sigs.k8s.io/karpenter/kwok"
