"""Files in and out, knowing nothing of the model: tokenizers (``tokenizer``: the ``Tokenizer``
interface and GPT-2's offline BPE), checkpoint formats (``checkpoints``) and the one file layer every
file kind of the library is written and read through (``files``: safetensors and JSON with digests, no
pickle)."""

from ..core.lazy import lazy_face

_FACE = {
    "tokenizer": ("Tokenizer", "GPT2Tokenizer", "HFTokenizer", "gpt2_tokenizer"),
    "checkpoints": ("read_weights", "read_hf_dir", "write_hf_dir", "embedded_path"),
    "corpora": ("brown_texts", "fetch_brown", "brown_available"),
    "gguf": ("read_gguf", "GGUFFile", "GGUFError"),
    "integrity": ("save_checked", "load_checked", "IntegrityError", "UnverifiedFileWarning"),
    "files": ("save_tree", "load_tree", "write_json", "read_json", "check_finite", "FileFormatError"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
