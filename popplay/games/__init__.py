"""Domains: the rules of each game or environment, written once for every backend."""
