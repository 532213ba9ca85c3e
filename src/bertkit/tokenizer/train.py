"""Vocabularies for the library-read models, trained by the `tokenizers` library's trainers: byte-level BPE as
RoBERTa's (<s> A </s></s> B </s>), and SentencePiece-style Unigram with Metaspace as XLM-R's / ALBERT's (NFKC, runs
of spaces collapsed; <s> A </s></s> B </s>). The result is a LibraryTokenizer; its save_pretrained writes a directory
that bertkit and transformers' AutoTokenizer both load. (WordPiece is bertkit's own: bertkit.vocab.)
"""

from __future__ import annotations

from typing import Iterable

from bertkit.errors import BertkitError, ConfigError
from bertkit.tokenizer.library import LibraryTokenizer

MODELS = ("bpe", "unigram")
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")   # RoBERTa's ids 0-4


def train_library_vocab(texts: Iterable[str], model: str = "bpe", vocab_size: int = 30_000, lowercase: bool = False,
                        min_frequency: int = 2, limit_alphabet: int | None = None,
                        progress: bool = False) -> LibraryTokenizer:
    """A byte-level BPE or Unigram tokenizer learned from texts (an iterable of str, streamed)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if model not in MODELS:
        raise ConfigError(f"model must be one of {', '.join(MODELS)} (or WordPiece, bertkit.vocab), got {model!r}")
    least = len(SPECIALS) + (256 if model == "bpe" else 2)   # byte-level BPE starts from all 256 bytes
    if vocab_size < least:    # checked before the corpus is read
        raise ConfigError(f"vocab_size must be at least {least} for {model} ({len(SPECIALS)} special tokens"
                          f"{' + 256 bytes' if model == 'bpe' else ''}), got {vocab_size}")
    lower = [normalizers.Lowercase()] if lowercase else []
    if model == "bpe":
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), *lower])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[*SPECIALS],
                                      show_progress=progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      **({"limit_alphabet": limit_alphabet} if limit_alphabet else {}))
    else:
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), *lower,
                                               normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=[*SPECIALS], unk_token="<unk>",
                                          show_progress=progress)
    try:
        tok.train_from_iterator(texts, trainer)
    except BertkitError:
        raise       # the corpus reader's own (a missing or corrupt file)
    except Exception as e:  # the library raises plain Exception
        raise ConfigError(f"{model} training failed (vocab_size={vocab_size}): {str(e)[:160]}") from None
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    if model == "bpe":
        tok.post_processor = processors.RobertaProcessing(("</s>", eos), ("<s>", bos), trim_offsets=True,
                                                          add_prefix_space=False)
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", bos), ("</s>", eos)])
    config = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "do_lower_case": lowercase}
    return LibraryTokenizer(tok.to_str(), config)
