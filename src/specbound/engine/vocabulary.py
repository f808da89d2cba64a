"""Drafts from a model with another tokenizer: Token-Level Intersection (TLI; Timor et al.,
ICML 2025, arXiv 2502.05202).

Convention (SPEC.md): p is the target's law, q the draft's. The **shared vocabulary** S pairs
the target's and the draft's tokens that stand for the same bytes (``token_bytes``: a
byte-level BPE token by its bytes, a SentencePiece one with ``▁`` as a space and ``<0xNN>`` as
its byte), each byte string once (the lowest id of each side); special tokens are never
matched by their text, only the draft's EOS to the target's EOS. The draft's law is
**restricted** to S: its logits outside S set to −∞ before the same processing as the
target's (temperature, top-k, top-p), so

    q_S(x) = processing(draft logits with x ∉ S at −∞)(x),   supported inside S,

and every draft is drawn from q_S and handed to the verifier as a row over the target's ids.
Verification is unchanged and lossless, since the verifier sees the very law the drafts were
drawn from. As every draft lies in S, any verifier's acceptance, and α* for q_S, are at most

    p(S) = Σ_{x ∈ S} p(x)   (``SharedVocabulary.shared_mass``),

the TLI bound, recorded beside them (``engine.optimum``).

The draft conditions on the target's sequence spelled in its own tokens (``Retokenizer``): a
context first drafted for is decoded to text and encoded by the draft's tokenizer; every
token appended after it is translated alone — a shared token as its draft twin, another by
the longest draft tokens that spell its bytes (a special token as the draft's special of the
same text, where there is one) — so the draft's context only grows, and its cache keeps the
accepted drafts as they were scored (``CrossTokenizerDrafter``). What the draft conditions
on changes how often it is accepted, never the output's law.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field

import torch

from specbound.engine.processing import Processing
from specbound.engine.tree import DraftTree

GROWTH = 2  # the draft's cache hint per target entry: a target token may take several draft tokens
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[chr(byte)] = byte
        else:
            characters[chr(256 + extra)] = byte
            extra += 1
    return characters


BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(tokenizer) -> list[bytes | None]:
    """The bytes each of ``tokenizer``'s ids stands for (index: token id; None for special
    tokens and for a token whose bytes cannot be told), read from its vocabulary by its
    decoder's kind: byte-level BPE (GPT-2's alphabet), SentencePiece (``▁`` a space,
    ``<0xNN>`` a byte), otherwise the token's decoded text."""
    vocabulary = tokenizer.get_vocab()
    special = {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
    added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items() if not token.special}
    decoder = json.dumps(json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder"))
    found: list[bytes | None] = [None] * (max(vocabulary.values()) + 1)
    for token, index in vocabulary.items():
        if index in special:
            continue
        if index in added:
            found[index] = added[index].encode()
        elif '"ByteLevel"' in decoder:
            found[index] = bytes(BYTE_LEVEL[character] for character in token) if set(token) <= BYTE_LEVEL.keys() \
                else None
        elif '"Metaspace"' in decoder or "\u2581" in decoder:
            byte = _BYTE_TOKEN.fullmatch(token)
            found[index] = bytes([int(byte.group(1), 16)]) if byte else token.replace("\u2581", " ").encode()
        else:
            text = tokenizer.convert_tokens_to_string([token])
            found[index] = None if "\ufffd" in text else text.encode()
    return found


@dataclass(frozen=True, eq=False)  # compared and hashed as itself: RestrictedProcessing keys on it
class SharedVocabulary:
    """The tokens both vocabularies share (module docstring): ``target_ids[i]`` and
    ``draft_ids[i]`` stand for the same string, each id at most once; probability rows are
    ``target_size`` and ``draft_size`` wide. ``retokenizer`` spells target sequences in the
    draft's tokens (None: a vocabulary for the math only)."""

    target_ids: torch.Tensor  # [shared] long
    draft_ids: torch.Tensor  # [shared] long
    target_size: int
    draft_size: int
    retokenizer: Retokenizer | None = None

    def __post_init__(self):
        if self.target_ids.shape != self.draft_ids.shape or self.target_ids.ndim != 1:
            raise ValueError("draft_ids: expected one draft id per shared target id")
        if len(set(self.target_ids.tolist())) < len(self.target_ids) or \
                len(set(self.draft_ids.tolist())) < len(self.draft_ids):
            raise ValueError("target_ids, draft_ids: each id may be shared once")
        target_of = torch.full((self.draft_size,), -1, dtype=torch.long)
        target_of[self.draft_ids] = self.target_ids
        object.__setattr__(self, "target_of", target_of)  # [draft_size] the target id of a draft id, -1 outside S
        object.__setattr__(self, "target_of_list", target_of.tolist())
        draft_mask = torch.zeros(self.draft_size, dtype=torch.bool)
        draft_mask[self.draft_ids] = True
        object.__setattr__(self, "draft_mask", draft_mask)  # [draft_size]
        target_mask = torch.zeros(self.target_size, dtype=torch.bool)
        target_mask[self.target_ids] = True
        object.__setattr__(self, "target_mask", target_mask)  # [target_size]

    @classmethod
    def of(cls, target_tokenizer, draft_tokenizer, target_size: int, draft_size: int) -> SharedVocabulary:
        """The tokens ``target_tokenizer`` and ``draft_tokenizer`` share (module docstring),
        with the ids below each model's row count (``target_size``, ``draft_size``).
        ValueError naming ``draft`` where no ordinary token is shared: such a draft could
        propose nothing but EOS."""
        target_bytes, draft_bytes = token_bytes(target_tokenizer), token_bytes(draft_tokenizer)
        draft_by_bytes = _first_ids(draft_bytes, draft_size)
        pairs = {}
        for spelled, target_id in _first_ids(target_bytes, target_size).items():
            if spelled in draft_by_bytes:
                pairs[target_id] = draft_by_bytes[spelled]
        if not pairs:
            raise ValueError(f"draft: the draft model's tokenizer shares no token with the target's "
                             f"({len(draft_by_bytes)} draft and {len(target_bytes)} target tokens compared by their "
                             "bytes), so it could draft nothing the target accepts; choose another --draft")
        target_eos, draft_eos = target_tokenizer.eos_token_id, draft_tokenizer.eos_token_id
        if target_eos is not None and draft_eos is not None and target_eos < target_size and draft_eos < draft_size:
            pairs = {target: draft for target, draft in pairs.items() if draft != draft_eos}
            pairs[target_eos] = draft_eos
        target_ids = torch.tensor(sorted(pairs), dtype=torch.long)
        draft_ids = torch.tensor([pairs[target] for target in sorted(pairs)], dtype=torch.long)
        retokenizer = Retokenizer(target_tokenizer, draft_tokenizer, target_bytes,
                                  dict(zip(target_ids.tolist(), draft_ids.tolist())), draft_by_bytes)
        return cls(target_ids, draft_ids, target_size, draft_size, retokenizer)

    def restrict(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """The draft's logits outside S at −∞.  # [rows, ≥ draft_size] -> [rows, draft_size]"""
        draft_logits = draft_logits[:, : self.draft_size]
        return draft_logits.masked_fill(~self.draft_mask.to(draft_logits.device), -math.inf)

    def to_target(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """A law supported in S, from the draft's ids to the target's.  # [draft_size] -> [target_size]"""
        target_probs = torch.zeros(self.target_size, dtype=draft_probs.dtype, device=draft_probs.device)
        target_probs[self.target_ids.to(draft_probs.device)] = draft_probs[self.draft_ids.to(draft_probs.device)]
        return target_probs

    def shared_mass(self, target_probs: torch.Tensor) -> torch.Tensor:
        """p(S) per row: the most any draft restricted to S is accepted.  # [rows, target_size] -> [rows] float64"""
        mask = self.target_mask.to(target_probs.device)
        return target_probs[:, mask].sum(dim=-1, dtype=torch.float64)

    def to_target_tree(self, tree: DraftTree, root: int) -> DraftTree:
        """``tree`` (drafted in the draft's ids, every draft in S) in the target's ids,
        below the target's last token ``root``; node numbers kept."""
        target_of = self.target_of_list
        drafts = {node: self.target_of.to(tokens.device)[tokens] for node, tokens in tree.draft_tokens.items()}
        if any(bool((tokens < 0).any()) for tokens in drafts.values()):
            raise ValueError("tree: a draft outside the shared vocabulary (its law was not restricted to it)")
        return dataclasses.replace(
            tree, tokens=[root] + [target_of[token] for token in tree.tokens[1:]], parents=list(tree.parents),
            depths=list(tree.depths), children=[{target_of[token]: child for token, child in children.items()}
                                                for children in tree.children],
            reach=list(tree.reach), ranks=list(tree.ranks), draft_tokens=drafts,
            draft_probs={node: self.to_target(probs) for node, probs in tree.draft_probs.items()},
            schemes=dict(tree.schemes), shared=self.target_mask)


def _first_ids(spellings: list[bytes | None], size: int) -> dict[bytes, int]:
    """Each non-empty byte string's lowest id below ``size``."""
    first: dict[bytes, int] = {}
    for index, spelled in enumerate(spellings[:size]):
        if spelled and spelled not in first:
            first[spelled] = index
    return first


@dataclass(frozen=True)
class RestrictedProcessing:
    """A ``Processing`` applied to the draft's logits restricted to the shared vocabulary:
    q_S, the law the drafts are drawn from (module docstring)."""

    processing: Processing
    vocabulary: SharedVocabulary
    draft_processing: Processing = field(init=False, repr=False, compare=False)  # over the draft's restricted row

    def __post_init__(self):
        object.__setattr__(self, "draft_processing", dataclasses.replace(self.processing, vocab_size=None))

    @property
    def vocab_size(self) -> int:
        return self.vocabulary.draft_size

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """q_S.  # [rows, draft logits] -> [rows, draft_size] float32"""
        return self.draft_processing.probs(self.vocabulary.restrict(logits))


class Retokenizer:
    """The target's token ids spelled in the draft's (module docstring): ``text`` for a
    whole context, ``token`` for one token appended to it. Neither is ever empty: a token
    the draft cannot spell at all is read as the draft's EOS."""

    def __init__(self, target_tokenizer, draft_tokenizer, target_bytes: list[bytes | None], draft_of: dict[int, int],
                 draft_by_bytes: dict[bytes, int]):
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.target_bytes = target_bytes  # ``token_bytes(target_tokenizer)``
        self.draft_by_bytes = draft_by_bytes  # each draft token's bytes -> its id (``_first_ids``)
        self.longest = max(map(len, draft_by_bytes), default=1)
        self.filler = draft_tokenizer.eos_token_id if draft_tokenizer.eos_token_id is not None else 0
        draft_special = {token.content: index for index, token in draft_tokenizer.added_tokens_decoder.items()
                         if token.special}
        self._tokens: dict[int, list[int]] = {target: [draft] for target, draft in draft_of.items()}
        for index, token in target_tokenizer.added_tokens_decoder.items():
            if token.special and index not in self._tokens:
                self._tokens[index] = [draft_special[token.content]] if token.content in draft_special \
                    else self.spell(token.content.encode())

    def text(self, target_ids: list[int]) -> list[int]:
        """A whole context: its text by the target's tokenizer, encoded by the draft's (a
        special token's spelling read as the draft's special token)."""
        text = self.target_tokenizer.decode(target_ids, skip_special_tokens=False)
        return self.draft_tokenizer(text, add_special_tokens=False)["input_ids"] or [self.filler]

    def token(self, target_id: int) -> list[int]:
        """One appended token: its draft twin where shared, else the spelling of its bytes."""
        if target_id not in self._tokens:
            spelled = self.target_bytes[target_id] if target_id < len(self.target_bytes) else None
            self._tokens[target_id] = self.spell(spelled or b"")
        return self._tokens[target_id]

    def spell(self, spelled: bytes) -> list[int]:
        """Draft ids spelling ``spelled``, longest match first (a byte no draft token spells
        is skipped)."""
        ids, start = [], 0
        while start < len(spelled):
            for end in range(min(len(spelled), start + self.longest), start, -1):
                if spelled[start:end] in self.draft_by_bytes:
                    ids.append(self.draft_by_bytes[spelled[start:end]])
                    start = end
                    break
            else:
                start += 1
        return ids or [self.filler]


class CrossTokenizerDrafter:
    """A ``ModelDrafter`` over a draft model with another tokenizer, restricted to the
    shared vocabulary (module docstring): it drafts on the draft's spelling of each context
    from q_S, and its trees are handed over in the target's ids."""

    def __init__(self, drafter, vocabulary: SharedVocabulary):
        if vocabulary.retokenizer is None:
            raise ValueError("vocabulary: needs its retokenizer (SharedVocabulary.of) to spell contexts for the draft")
        self.drafter = drafter
        self.vocabulary = vocabulary
        self.vocab_size = vocabulary.target_size
        self._spelled: list[tuple[int, list[int]] | None] = []  # per row: target tokens spelled, the draft's ids
        self._trees: list[DraftTree] = []
        self._restricted: dict[Processing, RestrictedProcessing] = {}

    @property
    def language_models(self) -> list:
        return self.drafter.language_models

    def restricted(self, processing: Processing) -> RestrictedProcessing:
        """A row's processing applied to the draft's logits restricted to the shared tokens."""
        if processing not in self._restricted:
            self._restricted[processing] = RestrictedProcessing(processing, self.vocabulary)
        return self._restricted[processing]

    def reset(self, prompts: list[list[int]], cells: int | None = None) -> None:
        self._spelled = [None] * len(prompts)
        self.drafter.reset(prompts, None if cells is None else GROWTH * cells)

    def draft(self, contexts, method, depths, generators, processings=None) -> list[DraftTree]:
        self._spelled += [None] * (len(contexts) - len(self._spelled))  # rows that joined the batch
        draft_contexts = [self._spell(row, context) for row, context in enumerate(contexts)]
        restricted = None if processings is None else [self.restricted(processing) for processing in processings]
        self._trees = self.drafter.draft(draft_contexts, method, depths, generators, restricted)
        return [self.vocabulary.to_target_tree(tree, context[-1]) for tree, context in zip(self._trees, contexts)]

    def _spell(self, row: int, context: list[int]) -> list[int]:
        """The draft's spelling of ``context``, extended by the tokens appended since."""
        retokenizer = self.vocabulary.retokenizer
        if self._spelled[row] is None:
            self._spelled[row] = (len(context), retokenizer.text(context))
        spelled, draft_ids = self._spelled[row]
        for token in context[spelled:]:
            draft_ids += retokenizer.token(token)
        self._spelled[row] = (len(context), draft_ids)
        return draft_ids

    def commit(self, trees, paths) -> None:
        self.drafter.commit(self._trees, paths)

    def select_rows(self, rows: list[int]) -> None:
        self._spelled += [None] * (max(rows, default=-1) + 1 - len(self._spelled))
        self._spelled = [self._spelled[row] for row in rows]
        self.drafter.select_rows(rows)
