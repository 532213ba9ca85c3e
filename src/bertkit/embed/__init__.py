"""Bi-encoder sentence embeddings: pooling, sentence-transformers directories, contrastive losses, GradCache,
an exact embedding index, retrieval metrics, and a step function for bertkit's training loop.
"""
