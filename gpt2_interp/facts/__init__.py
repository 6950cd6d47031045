"""Real-world facts (countries, cities, elements) with CounterFact-style prompts, and two-hop prompts that
chain two of them (:mod:`gpt2_interp.facts.two_hop`)."""

from gpt2_interp.facts.base import Fact, FactBase
from gpt2_interp.facts.two_hop import TwoHopCase, two_hop_cases, two_hop_chains

__all__ = ["Fact", "FactBase", "TwoHopCase", "two_hop_cases", "two_hop_chains"]
