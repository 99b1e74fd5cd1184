"""A model's price: a connection's own, else MODEL_PRICES, else genai-prices' table; nothing if it runs here."""

import genai_prices
import pytest
from genai_prices import Usage, calc_price

from webapp.admin import prices
from webapp.admin.prices import price_of

OPENAI = "https://api.openai.com/v1"
OPENROUTER = "https://openrouter.ai/api/v1"


def _listed(model: str, **provider) -> tuple:
    """genai-prices' own dollars per million input and output tokens, asked directly, below any tier."""
    found = calc_price(Usage(input_tokens=100_000, output_tokens=100_000), model, **provider)
    return pytest.approx(float(found.input_price * 10)), pytest.approx(float(found.output_price * 10))


@pytest.fixture(autouse=True)
def _no_cached_lookups():
    prices._listed_price.cache_clear()


def test_known_models_are_priced_from_genai_prices(app, offline):
    app.config["MODEL_PRICES"] = {}

    openai = price_of("gpt-4o-mini", provider_url=OPENAI)
    guessed = price_of("gpt-4o-mini")  # no URL: by the model id alone
    openrouter = price_of("openai/gpt-4o-mini", provider_url=OPENROUTER)
    # No URL, an id with a slash: as OpenRouter prices it.
    openrouter_id = price_of("anthropic/claude-sonnet-4.5")

    assert (openai.input, openai.output, openai.source) == (
        *_listed("gpt-4o-mini", provider_id="openai"),
        "genai-prices",
    )
    assert (guessed.input, guessed.output) == (openai.input, openai.output)
    assert (openrouter.input, openrouter.output) == _listed("openai/gpt-4o-mini", provider_api_url=OPENROUTER)
    assert (openrouter_id.input, openrouter_id.output) == _listed(
        "anthropic/claude-sonnet-4.5", provider_id="openrouter"
    )
    assert openai.input > 0 and openrouter_id.output > 0
    # A server elsewhere on the network is not "here": the model is priced by its id.
    assert price_of("gpt-4o-mini", provider_url="http://192.168.1.20:8000/v1").source == "genai-prices"
    assert not genai_prices.data_snapshot.get_snapshot().from_auto_update  # the bundled table, not a download


def test_a_connections_price_wins_over_model_prices_which_wins_over_genai_prices(app):
    app.config["MODEL_PRICES"] = {"gpt-4o-mini": {"input": 1, "output": 2}}

    configured = price_of("gpt-4o-mini", provider_url=OPENAI)
    overridden = price_of(
        "gpt-4o-mini", provider_url=OPENAI, overrides={"gpt-4o-mini": {"input": 5, "output": 6}}
    )
    elsewhere = price_of("gpt-4o-mini", overrides={"gpt-4o": {"input": 5, "output": 6}})

    assert (configured.input, configured.output, configured.source) == (1, 2, "MODEL_PRICES")
    assert (overridden.input, overridden.output, overridden.source) == (5, 6, "connection")
    assert elsewhere.source == "MODEL_PRICES"  # an override for another model changes nothing here


@pytest.mark.parametrize(
    ("model", "url"),
    [
        ("smollm2", None),  # the bundled model, wherever the ledger says it ran
        ("smollm2", OPENROUTER),
        ("llama3.2:3b", "http://127.0.0.1:11434/v1"),  # Ollama on this machine
        # Not DeepSeek's API, though the table would price this name as DeepSeek's.
        ("deepseek-r1:8b", "http://localhost:11434/v1"),
        ("qwen2.5", "http://[::1]:8080/v1"),
    ],
)
def test_models_that_run_here_cost_nothing(app, model, url):
    price = price_of(model, provider_url=url)

    assert (price.input, price.output, price.source) == (0, 0, "runs here")


def test_model_prices_can_price_a_model_that_runs_here(app):
    app.config["MODEL_PRICES"] = {"llama3.2:3b": {"input": 0.01, "output": 0.02}}

    assert price_of("llama3.2:3b", provider_url="http://127.0.0.1:11434/v1").source == "MODEL_PRICES"


@pytest.mark.parametrize(
    ("model", "url"),
    [
        ("ada-model", None),
        ("ada-model", OPENAI),
        ("llama3.2:3b", None),
        ("vendor/unheard-of", OPENROUTER),
    ],
)
def test_unknown_models_have_no_price(app, model, url):
    assert price_of(model, provider_url=url) is None


def test_lookups_in_the_table_are_cached(app, monkeypatch):
    price_of("gpt-4o-mini", provider_url=OPENAI)
    monkeypatch.setattr(genai_prices, "calc_price", lambda *args, **kwargs: pytest.fail("looked up again"))

    assert price_of("gpt-4o-mini", provider_url=OPENAI).source == "genai-prices"
