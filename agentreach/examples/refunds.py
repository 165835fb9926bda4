"""Two agents whose descriptions overlap, as in the design's example: a refund request may be
customer service's or risk control's. Run both, then send free text to ``reach.task.auto``:

    reach agent agentreach.examples.refunds:service
    reach agent agentreach.examples.refunds:risk
    nats pub reach.task.auto '{"text": "The blender arrived broken, I want my money back"}'
"""

from typing import Any

from agentreach.agents import Agent, TaskContext

REFUNDS = (
    "Refunds for paid orders: checks the order and the payment, then returns the money to the"
    " original payment method for returned, damaged, missing or unwanted items."
    " 为已支付订单办理退款：核对订单与支付，把钱退回原支付方式。"
)
REFUND_EXAMPLES = [
    "I want my money back for order 1234",
    "The blender arrived broken, please refund me",
    "申请退款，订单号 20250112",
    "退货后多久能退款到账？",
]
RISK = (
    "Risk control and fraud: unauthorised charges, stolen cards, suspicious orders, refund abuse;"
    " reviews and freezes risky payments. 风控审核：盗刷、未经授权的扣款、可疑订单、恶意退款。"
)
RISK_EXAMPLES = [
    "There's a charge on my card I didn't make",
    "Someone is using my stolen card",
    "我的卡被盗刷了",
]


def agents() -> tuple[Agent, Agent]:
    """customer-service serves refund_application, risk-control serves risk_review."""
    service = Agent("customer-service", startup_delay=0)
    risk = Agent("risk-control", startup_delay=0)

    @service.handler("refund_application", description=REFUNDS, examples=REFUND_EXAMPLES)
    async def refund(ctx: TaskContext, payload: Any) -> dict[str, object]:
        return {"refunded": True, "by": "customer-service"}

    @risk.handler("risk_review", description=RISK, examples=RISK_EXAMPLES)
    async def review(ctx: TaskContext, payload: Any) -> dict[str, object]:
        return {"frozen": True, "by": "risk-control"}

    return service, risk


service, risk = agents()
