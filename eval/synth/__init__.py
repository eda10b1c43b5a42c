"""The toy world: seeded video, image and geolocation tasks that need tools, their oracles and scoring.

``families`` generates items, ``render``/``font`` draw them, ``perception`` reads them back, ``oracle``
plays them perfectly (with or without tools) and ``scoring`` scores answers. The benchmark built from
them is :mod:`mmagent.eval.benchmarks.synth`; the SFT data, :mod:`mmagent.training.synth_data`.
"""
