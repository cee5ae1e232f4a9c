"""The one place torch is known below the public APIs: torch <-> numpy element
mapping (``torch_bridge``) and the one host -> device staging buffer (``staging``)."""
