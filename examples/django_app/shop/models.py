"""An order, and the stock it reserves."""
from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    quantity = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)


class Stock(models.Model):
    item = models.CharField(max_length=100, unique=True)
    left = models.PositiveIntegerField(default=0)
