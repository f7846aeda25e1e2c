"""The runner: wires the components together (``wiring``) and drives them, in one process
(``serial``) or many (``parallel`` and its ``children``, supervised by ``supervisor``), with
sampler nodes on other machines (``node``, ``link``)."""
