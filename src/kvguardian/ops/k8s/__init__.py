"""Kubernetes: a device plugin that hands each pod a KV-cache budget (`plugin`, gRPC over a unix socket) and
the manifests in ``deploy/k8s`` (`manifests`). ``import kvguardian.ops.k8s`` imports neither grpc nor yaml."""
