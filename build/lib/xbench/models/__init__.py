"""Vision-language models under test and the baselines that frame them."""
