"""uaii.tokenizers — text <-> token ids for UAII models, with chat templates and streaming detokenization.

    from uaii.tokenizers import load
    tok = load("model.gguf")                 # or an HF directory (tokenizer.json / tokenizer.model / vocab.txt)
    ids = tok.encode("Hello")                # BOS/EOS as the model's metadata says
    text = tok.decode(ids)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    stream = tok.stream(); pieces = [stream.step(i) for i in ids]; rest = stream.finish()

GGUF vocabularies give llama.cpp's ids; tokenizer.json directories give HF tokenizers' / transformers' ids. See
packages/uaii-tokenizers/README.md and docs/tokenizers.md.
"""

from importlib.metadata import version as _version

from uaii.tokenizers.chat import render as render_chat_template
from uaii.tokenizers.errors import ChatTemplateError, TokenizerError, TokenizerFormatError
from uaii.tokenizers.fim import FimTokens
from uaii.tokenizers.hf import HFTokenizer
from uaii.tokenizers.loader import ENTRY_POINT_GROUP, TokenizerFormat, formats, from_gguf_metadata, load
from uaii.tokenizers.pieces import PieceTokenizer
from uaii.tokenizers.pretokenizers import PRE_TOKENIZERS
from uaii.tokenizers.stream import StreamDecoder
from uaii.tokenizers.string_table import StringTable, release_mapped_pages, scan_gguf_strings
from uaii.tokenizers.tokenizer import Tokenizer

__version__ = _version("uaii-tokenizers")
__all__ = [
    "ENTRY_POINT_GROUP",
    "PRE_TOKENIZERS",
    "ChatTemplateError",
    "FimTokens",
    "HFTokenizer",
    "PieceTokenizer",
    "StreamDecoder",
    "StringTable",
    "Tokenizer",
    "TokenizerError",
    "TokenizerFormat",
    "TokenizerFormatError",
    "__version__",
    "formats",
    "from_gguf_metadata",
    "load",
    "release_mapped_pages",
    "render_chat_template",
    "scan_gguf_strings",
]
