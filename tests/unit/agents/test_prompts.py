"""System prompt generation from the goal."""

from __future__ import annotations

from app.agents.services.prompts import GENERATED_KEY, apply_system_prompt, generate_system_prompt

BASE = {"title": "Helper", "goal": "Answer questions", "systemPrompt": ""}


def test_template_is_deterministic_and_uses_the_style_fields():
    agent = {**BASE, "description": "A helper.", "capabilities": ["a", "b"], "responseStyle": "formal",
             "personalityTraits": ["calm", "precise"], "fallbackMessage": "Sorry."}
    prompt = generate_system_prompt(agent)
    assert prompt == generate_system_prompt(dict(agent))
    assert prompt.splitlines()[0] == "You are Helper."
    for part in ("A helper.", "Answer questions", "- a", "- b", "formal", "calm, precise", '"Sorry."'):
        assert part in prompt


def test_empty_prompt_with_goal_is_generated_and_marked():
    doc = dict(BASE)
    apply_system_prompt(doc, previous=None, prompt_sent=False, moment_iso="2026-11-22T00:00:00Z")
    assert doc["systemPrompt"] == generate_system_prompt(BASE)
    assert doc["metadata"][GENERATED_KEY] == {"source": "goal", "template": "goal-template-v1",
                                              "generatedAt": "2026-11-22T00:00:00Z"}


def test_no_goal_no_generation():
    doc = {"title": "Helper", "systemPrompt": ""}
    apply_system_prompt(doc, previous=None, prompt_sent=False, moment_iso="t")
    assert doc == {"title": "Helper", "systemPrompt": ""}


def test_unchanged_inputs_keep_the_original_generation_stamp():
    first = dict(BASE)
    apply_system_prompt(first, previous=None, prompt_sent=False, moment_iso="first")
    second = {**first, "metadata": dict(first["metadata"])}
    apply_system_prompt(second, previous=first, prompt_sent=False, moment_iso="second")
    assert second["metadata"][GENERATED_KEY]["generatedAt"] == "first"


def test_a_written_prompt_drops_the_marker():
    first = dict(BASE)
    apply_system_prompt(first, previous=None, prompt_sent=False, moment_iso="t")
    mine = {**first, "systemPrompt": "Mine"}
    apply_system_prompt(mine, previous=first, prompt_sent=True, moment_iso="t2")
    assert mine["systemPrompt"] == "Mine" and "metadata" not in mine
