"""Bi-encoder sentence embeddings: training, storage and search.

    pooling.py    Pooling (cls / max / mean / mean_sqrt_len / weighted_mean / last_token), Dense,
                  SentenceEncoder (+ optional unit L2 norm): BertModel -> (batch, dim) vectors
    st_format.py  load_sentence_encoder / save_sentence_encoder: sentence-transformers directories (and plain HF
                  BERT directories, mean-pooled)
    losses.py     MultipleNegativesRankingLoss (InfoNCE; hard negatives, symmetric, learnable scale, false
                  negatives masked), CoSENTLoss, CosineMSELoss
    gradcache.py  cached_loss: GradCache, large contrastive batches in the memory of a mini-batch
    index.py      EmbeddingIndex / IndexWriter / write_index: vectors on disk, exact blocked top-k, model_hash
    metrics.py    retrieval_metrics (recall@k, MRR@10, nDCG@10), similarity_metrics (Spearman, Pearson)
    train.py      EmbedDataset (files), EmbedModel, embed_step for bertkit.train.train, eval_fns

Submodules are imported on use (`from bertkit.embed.losses import ...`), so importing one does not pull the rest.
"""
