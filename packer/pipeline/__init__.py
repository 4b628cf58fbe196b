"""The offline pipeline behind ``packer build`` and ``packer validate``: raw files to shards.

One module per stage, in the order :func:`packer.pipeline.stages.run_stages` runs them
(``stages.STAGES``): ``discover`` (client listing) → ``pixels`` (dask: ``probe`` the header,
:mod:`packer.read` + :mod:`packer.transform`, ``checks``, ``spill`` into the build cache) →
``nearcopy`` → ``conflicts`` (copies whose targets disagree) → ``split`` (over ``dedup``
groups) → ``audit`` → ``plan`` → ``assemble`` (dask: spill into :mod:`packer.shards`).
``build`` publishes a version (``publish``, manifest, reports); ``datacheck`` is ``packer
validate``. ``cluster`` is the only module that imports dask; ``rawstore`` lists and fetches
raw files behind URLs; ``sampletable`` keeps the client's records in columns. Nothing outside
the commands imports this package but the benchmarks.
"""
