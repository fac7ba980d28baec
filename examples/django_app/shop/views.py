"""POST /orders: save the order, enqueue its receipt and reserve stock, all
in one atomic() block. When the stock runs out, the block rolls back and
the receipt job never existed (no worker ever sees it)."""
from __future__ import annotations

from django.db import connection, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from .models import Order, Stock
from .tasks import send_receipt


class OutOfStock(Exception):
    pass


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    item = request.POST.get("item", "")
    quantity = request.POST.get("quantity", "1")
    if not item or not quantity.isdigit() or int(quantity) < 1:
        return JsonResponse({"error": "item and a quantity >= 1 are required"}, status=400)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=item, quantity=int(quantity))
            job_id = send_receipt.enqueue(connection, order_id=order.pk)
            reserved = Stock.objects.filter(item=item, left__gte=int(quantity)) \
                .update(left=F("left") - int(quantity))
            if not reserved:
                raise OutOfStock(f"not enough {item!r} in stock")
    except OutOfStock as exc:
        return JsonResponse({"error": str(exc)}, status=409)
    return JsonResponse({"order_id": order.pk, "job_id": job_id}, status=202)
