"""Flower App of bench/peers/deploy.py (issue 21)."""
