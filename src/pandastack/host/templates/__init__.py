"""Templates: built-in ones, user template builds, their steps and step cache."""
