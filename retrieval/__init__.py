"""Query planning: encode, apply relations, ANN search, filters, explanations."""
