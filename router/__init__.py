"""Which model tier and which engine endpoint serve a request. Pure: no web framework, no Kopf."""
