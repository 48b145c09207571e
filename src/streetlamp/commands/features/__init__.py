"""``streetlamp features TEXT --features DICT``: the feature dashboard. Per token of TEXT the top active features;
for each shown feature (the most active on TEXT, or ``--feature-ids``) its dashboard over a corpus: top
activating contexts, contexts by activation decile, activation density, and the tokens its decoder direction
promotes and suppresses through the unembedding (the computation: :mod:`streetlamp.features.dashboard`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import StreetlampError
from ...settings import Settings, Shared, option
from ..base import Command, lazy

if TYPE_CHECKING:
    from ...models.adapter import ModelAdapter


@dataclass
class FeaturesSettings(Settings):
    text: str = option("", positional=True, help="the text whose tokens' features are shown")
    features: str = option(
        "", help="the feature set (required): a folder of streetlamp's, SAELens's or circuit-tracer's format"
    )
    feature_ids: str | None = option(
        None,
        help="comma list of features to show, as L<layer>.<site>.<index> (e.g. L1.mlp.5); default: the --top "
        "features with the largest activation on TEXT",
    )
    top: int = option(8, ge=1, le=1000, help="show the N features most active on TEXT (default 8)")
    per_token: int = option(5, ge=1, le=1000, help="top active features listed per token of TEXT (default 5)")
    data: str = option(
        "mix",
        help="the corpus: mix (tweets, drugs, movies, BIG-Bench task text where cached), tweets, drugs, movies, "
        "recall, bigbench, or .csv/.jsonl files with a text column (comma-separated)",
    )
    sequences: int = option(400, ge=1, le=10_000_000, help="corpus texts read (default 400)")
    seq_len: int = option(64, ge=2, le=100_000, help="tokens per corpus text, the separator included (default 64)")
    contexts: int = option(10, ge=1, le=1000, help="top activating contexts kept per feature (default 10)")
    per_decile: int = option(2, ge=0, le=100, help="contexts shown per activation decile (default 2)")
    reservoir: int = option(
        4096,
        ge=10,
        le=10_000_000,
        help="sequences per feature sampled for the decile boundaries (exact while fewer fire; default 4096)",
    )
    logit_k: int = option(10, ge=1, le=1000, help="promoted and suppressed tokens listed per feature (default 10)")

    def check(self) -> None:
        super().check()
        if not self.text.strip():
            raise StreetlampError("empty text: give the text whose tokens' features are shown")
        if not self.features:
            raise StreetlampError("features needs --features DICT: the folder of dictionaries whose features it shows")
        if not Path(self.features).is_dir():
            raise StreetlampError(f"--features {self.features}: not a folder")

    def validate(self, adapter: ModelAdapter) -> None:
        from ...features.dashboard import parse_feature_ids, read_ids
        from ...models.dictionaries import load_features

        if adapter.modality != "text" or not adapter.kind.causal:
            raise StreetlampError(
                f"features reads texts as a causal LM does (after the document separator) and the promoted tokens "
                f"through its LM head; {adapter.name} is a {adapter.kind}: not supported"
            )
        adapter.attach_features(load_features(self.features, adapter))
        assert adapter.features is not None
        if self.feature_ids is not None:
            parse_feature_ids(self.feature_ids, adapter.features)
        n = len(read_ids(adapter, self.text))
        if n > adapter.max_positions:
            raise StreetlampError(
                f"the text is {n} tokens with the separator; {adapter.name} takes at most {adapter.max_positions}"
            )
        if n <= 1:
            raise StreetlampError("the text has no token for this tokenizer")
        if self.seq_len > adapter.max_positions:
            raise StreetlampError(f"--seq-len {self.seq_len}: {adapter.name} takes at most {adapter.max_positions}")


FEATURES = Command(
    "features",
    "feature dashboard: per token of TEXT the top active features; per feature its top contexts and contexts by "
    "activation decile over a corpus, its density, and the tokens its decoder promotes and suppresses",
    FeaturesSettings,
    lazy(__name__ + ".run"),
    shared=Shared(model="smollm2-135m"),
    views=("features",),
)
