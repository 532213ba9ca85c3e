"""Bi-encoder sentence embeddings: pooling (pooling.py), sentence-transformers directories (st_format.py), losses
and GradCache (losses.py, gradcache.py), training and evaluation (train.py, runner.py, metrics.py, mine.py), vectors
on disk and search (index.py). Submodules are imported on use, so importing one does not pull the rest.
"""
