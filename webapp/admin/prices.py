"""What a model costs: dollars per million input and output tokens, and where that price came from.

In order: the connection's own price for the model (`overrides`), the MODEL_PRICES setting, then the
genai-prices table (a snapshot bundled with the package, read offline: Cairn never starts its `UpdatePrices`,
the one part of it that fetches). A model that runs on this machine, the bundled SmolLM2 or any model served
from a loopback URL such as Ollama's, costs nothing per token. Any other model has no known price.
"""

import ipaddress
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import urlsplit

from flask import current_app

from webapp.config import LOCAL_MODEL_ID

# Where a price came from, as the usage pages say it.
CONNECTION = "connection"
MODEL_PRICES = "MODEL_PRICES"
GENAI_PRICES = "genai-prices"
RUNS_HERE = "runs here"

# genai-prices prices a call; this sample is below every tier (some models cost more past 200k tokens).
_SAMPLE_TOKENS = 1_000
_SAMPLES_PER_MILLION = 1_000_000 // _SAMPLE_TOKENS


@dataclass(frozen=True)
class Price:
    """Dollars per million input and output tokens, and their source (CONNECTION, MODEL_PRICES, ...)."""

    input: float
    output: float
    source: str

    def dollars(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input + output_tokens * self.output) / 1_000_000


def price_of(
    model: str, *, provider_url: str | None = None, overrides: dict[str, dict[str, float]] | None = None
) -> Price | None:
    """The price of `model` as served at `provider_url` (a base URL, when known); None when no price is known.

    `overrides` are a connection's prices per model, shaped like MODEL_PRICES, which they win over.
    """
    for source, table in ((CONNECTION, overrides or {}), (MODEL_PRICES, current_app.config["MODEL_PRICES"])):
        if model in table:
            return Price(float(table[model].get("input", 0)), float(table[model].get("output", 0)), source)
    # Before the table, which prices names that Ollama reuses: "deepseek-r1:8b" here is not DeepSeek's API.
    if model == LOCAL_MODEL_ID or _runs_here(provider_url):
        return Price(0.0, 0.0, RUNS_HERE)
    return _listed_price(model, provider_url)


@lru_cache(maxsize=256)
def _runs_here(provider_url: str | None) -> bool:
    """True for a URL on this machine (localhost, 127.0.0.0/8, ::1): a model served there is not billed."""
    if not provider_url:
        return False
    host = urlsplit(provider_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


@lru_cache(maxsize=1024)
def _listed_price(model: str, provider_url: str | None) -> Price | None:
    """genai-prices' price for the model: at the provider of this URL, else by the model id alone, else as an
    OpenRouter id ("openai/gpt-4o-mini"). Prices that change over time are taken as of the first lookup."""
    # Imported on first use: the table is 1.6 MB of Python that only the usage pages need, not every worker.
    from genai_prices import Usage, calc_price

    attempts = [{"provider_api_url": provider_url}] if provider_url else []
    attempts.append({})
    if "/" in model:
        attempts.append({"provider_id": "openrouter"})
    sample = Usage(input_tokens=_SAMPLE_TOKENS, output_tokens=_SAMPLE_TOKENS)
    for provider in attempts:
        try:
            found = calc_price(sample, model, **provider)
        except LookupError:  # this provider, or no provider, lists the model
            continue
        per_million = (found.input_price * _SAMPLES_PER_MILLION, found.output_price * _SAMPLES_PER_MILLION)
        return Price(*map(float, per_million), GENAI_PRICES)  # Decimal times int is exact: 0.15 stays 0.15
    return None
