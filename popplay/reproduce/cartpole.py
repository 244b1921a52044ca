"""Bell's cart-pole figures (report §2.5): Figures 6-9. (In progress.)"""
from __future__ import annotations
