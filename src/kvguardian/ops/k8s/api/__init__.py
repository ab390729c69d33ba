"""The kubelet device-plugin API v1beta1: ``deviceplugin.proto`` and the modules grpcio-tools generates from it
(by setup.py, at build time: they are not in the repository)."""
