"""Arc2Face conditioning: an identity embedding written into the `id` token slot of a CLIP text encoder.

Template `photo of a id person`; the L2-normalised embedding, zero-padded to the encoder width, overwrites the raw
token embedding of `id` (position 4 of 77, before position embeddings); the encoder's last hidden state is the
condition. Unconditional = the empty prompt through the same encoder (Arc2Face, see reference-facts).
"""

from __future__ import annotations

import torch
from torch import nn

SEQUENCE_LENGTH = 77
BOS, EOS = 49406, 49407
ID_PROMPT = "photo of a id person"
# CLIP BPE ids of ID_PROMPT and of the empty prompt. `id` = 1014 is in Arc2Face's code; load_arc2face checks the
# whole list against SD1.5's tokenizer files when they are there (check_template_ids). SD1.5's tokenizer pads with EOS.
ID_PROMPT_IDS = [BOS, 1125, 539, 320, 1014, 2533, EOS]
EMPTY_PROMPT_IDS = [BOS, EOS]
ID_TOKEN = 1014
ID_TOKEN_POSITION = ID_PROMPT_IDS.index(ID_TOKEN)


def check_template_ids(tokenize) -> None:
    """Raise unless ``tokenize(text) -> ids`` (a CLIP tokenizer, special tokens added, no padding) gives the
    hard-coded ids of the template and of the empty prompt: the encoder would otherwise write the identity into
    another token's slot than the one Arc2Face was trained with."""
    for text, expected in ((ID_PROMPT, ID_PROMPT_IDS), ("", EMPTY_PROMPT_IDS)):
        got = [int(i) for i in tokenize(text)]
        if got != expected:
            raise ValueError(f"the tokenizer gives {got} for {text!r}, but the conditioning is built on {expected} "
                             "(Arc2Face's template on SD1.5's CLIP tokenizer): the tokenizer files are not SD1.5's")


def padded_ids(ids: list[int], length: int = SEQUENCE_LENGTH, pad: int = EOS) -> list[int]:
    return ids + [pad] * (length - len(ids))


class IdentityTextEncoder(nn.Module):
    """Wraps a transformers CLIPTextModel; ``forward(embeddings)`` returns (N, 77, width) conditions.

    ``token_map`` remaps CLIP ids to a small vocabulary (the mini encoder carries only the template's tokens);
    None keeps CLIP ids (the real Arc2Face encoder).
    """

    def __init__(self, text_model: nn.Module, token_map: dict[int, int] | None = None):
        super().__init__()
        self.text_model = text_model
        self.token_map = token_map
        self.width = text_model.config.hidden_size
        self._pending: torch.Tensor | None = None
        # transformers 5 ignores inputs_embeds in CLIPTextModel.forward: overwrite the looked-up rows in a hook
        text_model.embeddings.token_embedding.register_forward_hook(self._overwrite_id_rows)
        self.register_buffer("id_ids", self._ids(ID_PROMPT_IDS), persistent=False)
        self.register_buffer("empty_ids", self._ids(EMPTY_PROMPT_IDS), persistent=False)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        ids = padded_ids(ids)
        if self.token_map is not None:
            ids = [self.token_map[i] for i in ids]
        return torch.tensor(ids, dtype=torch.long)[None]

    def _overwrite_id_rows(self, module, inputs, output):
        if self._pending is None:
            return output
        output = output.clone()
        output[:, ID_TOKEN_POSITION] = self._pending.to(output.dtype)
        return output

    def pad_embedding(self, embeddings: torch.Tensor) -> torch.Tensor:
        """L2-normalise and zero-pad (N, D) embeddings on the right to the encoder width."""
        if embeddings.shape[-1] > self.width:
            raise ValueError(f"identity embedding of size {embeddings.shape[-1]} exceeds encoder width {self.width}")
        embeddings = nn.functional.normalize(embeddings.float(), dim=-1)
        return nn.functional.pad(embeddings, (0, self.width - embeddings.shape[-1]))

    def forward(self, embeddings: torch.Tensor) -> torch.Tensor:
        self._pending = self.pad_embedding(embeddings)
        try:
            ids = self.id_ids.expand(len(embeddings), -1)
            return self.text_model(input_ids=ids).last_hidden_state
        finally:
            self._pending = None

    def unconditional(self, n: int) -> torch.Tensor:
        return self.text_model(input_ids=self.empty_ids.expand(n, -1)).last_hidden_state
