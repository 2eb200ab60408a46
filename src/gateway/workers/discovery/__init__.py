"""Worker discovery: DNS records or Kubernetes pods -> the registry, through the same
add/remove path as ``POST /workers`` and ``DELETE /workers`` (``GatewayState``)."""
