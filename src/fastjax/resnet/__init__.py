"""The ResNet example (Part II and Part VI, chapter 3): the digits data (``digits``), the network in
Flax NNX (``resnet_nnx``) and Equinox (``resnet_eqx``), the rungs the chapters teach (``rungs``, and
Part VI's ``floor``: both GENERATED from the chapters), the ladder that binds them (``ladder``) and the
bench that times it (``bench``). Part VI's floor page also reads a step's time convolution by convolution
(``conv_trace``), checks its changed steps against the floor (``floor_checks``) and builds its experiments
(``floor_variants``).
"""
