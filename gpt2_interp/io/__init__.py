"""Files in and out, knowing nothing of the model: tokenizers (``tokenizer``: the ``Tokenizer``
interface and GPT-2's offline BPE) and checkpoint formats (``checkpoints``)."""
