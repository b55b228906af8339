"""The local stack behind `fleetgate up`: model preparation, engine subprocesses, the gateway."""
