"""The engine container: Dockerfiles and the thin entrypoint (`fleetgate.engine_image.entrypoint`)."""
