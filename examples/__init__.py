"""Research code built on fedjax-het without editing it (docs/extending.md).

The modules here are what a user writes in their own project: an algorithm
(``fedprox``), a model family (``my_models``), a dataset (``make_dataset``), a
partition (``make_partition``) and a run's partition read back for another library
(``take_partition``); ``configs/`` holds their experiment and sweep files.
tests/test_extending.py imports and runs every one of them.
"""
