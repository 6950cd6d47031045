"""Real-world facts (countries, cities, elements) with CounterFact-style prompts."""

from gpt2_interp.facts.base import Fact, FactBase

__all__ = ["Fact", "FactBase"]
