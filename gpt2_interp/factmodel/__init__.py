"""Tooling for the embedded fact model ``gpt2-facts``: training it (``train``) and measuring it
(``quality``, which writes its model card). It sits above analysis — it uses the model, the
tokenizer, the logit lens and the fact data — while the fact *data* stays low in ``facts``."""

from ..core.lazy import lazy_face

_FACE = {
    "train": ("build_examples", "corpus_hash"),
    "quality": ("measure", "model_card"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
