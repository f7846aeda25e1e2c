"""Runners drive the components: ``serial`` in one process, ``parallel`` across processes."""
