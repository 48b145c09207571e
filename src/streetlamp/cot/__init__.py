"""Chain-of-thought faithfulness: data, prompts, engines, the mention rule and the papers' scores."""
