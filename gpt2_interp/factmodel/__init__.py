"""Tooling for the embedded fact model ``gpt2-facts``: training it (``train``) and measuring it
(``quality``, which writes its model card). It sits above analysis — it uses the model, the
tokenizer, the logit lens and the fact data — while the fact *data* stays low in ``facts``."""
