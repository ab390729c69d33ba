"""The kubelet device-plugin API v1beta1: ``deviceplugin.proto`` and the modules grpcio-tools generates from it."""
