"""The geometry every layer shares: the decoded image, a model's input made from it, and a map placed back into the metric frame."""
