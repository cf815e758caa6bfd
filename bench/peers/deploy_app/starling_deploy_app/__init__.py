"""Flower App of bench/peers/deploy.py."""
