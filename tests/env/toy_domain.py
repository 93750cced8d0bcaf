"""A toy shop domain kept in the test suite, not in prour: what a user brings for a domain that no
package ships, registered through a recipe's ``plugins: [toy_domain]`` (prour.env.plugins).
docs/evaluation.md ("Bringing a domain of your own") shows the same shape.

The shop sells four products. One READ tool lists them, one WRITE tool orders one unit. Each
task's customer wants one product; its reference actions are the catalogue look-up and the
order, and the reward is tau2's DB and ACTION checks (no scoring function of the domain's own).
Splits: ``base`` (all four), ``test`` (1, 2) and ``train`` (3, 4).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from tau2.data_model.tasks import Task
from tau2.environment.db import DB
from tau2.environment.environment import Environment
from tau2.environment.toolkit import ToolKitBase, ToolType, is_tool

from prour.env.plugins import DomainPlugin, register_domain

NAME = "toy"
POLICY = """\
# Toy shop agent policy
You help a customer of a small shop order one product. Look the product up with
`list_products`, then order it with `place_order` using its SKU. One order per conversation."""


class Product(BaseModel):
    sku: str
    name: str
    color: str
    stock: int


class ShopDB(DB):
    """The shop's database: products by SKU, orders by id (the SKU ordered)."""

    products: dict[str, Product]
    orders: dict[str, str] = Field(default_factory=dict)


def default_db() -> ShopDB:
    items = [("MUG-BLUE", "mug", "blue"), ("MUG-GREEN", "mug", "green"),
             ("SCARF-RED", "scarf", "red"), ("SCARF-GREY", "scarf", "grey")]
    return ShopDB(products={sku: Product(sku=sku, name=name, color=color, stock=3)
                            for sku, name, color in items})


class ShopTools(ToolKitBase):
    """The agent's tools."""

    db: ShopDB

    @is_tool(ToolType.READ)
    def list_products(self) -> list[Product]:
        """List every product of the shop with its color and stock."""
        return list(self.db.products.values())

    @is_tool(ToolType.WRITE)
    def place_order(self, sku: str) -> str:
        """Order one unit of a product.

        Args:
            sku: The product's SKU, as list_products shows it.

        Returns:
            The id of the new order.
        """
        product = self.db.products.get(sku)
        if product is None:
            raise ValueError(f"Unknown SKU {sku}")
        if product.stock < 1:
            raise ValueError(f"{sku} is out of stock")
        product.stock -= 1
        order_id = f"O{len(self.db.orders) + 1}"
        self.db.orders[order_id] = sku
        return order_id


def environment() -> Environment:
    """A fresh shop in its default state."""
    return Environment(domain_name=NAME, policy=POLICY, tools=ShopTools(default_db()))


def _task(task_id: str, color: str, item: str, sku: str) -> Task:
    return Task.model_validate({
        "id": task_id,
        "user_scenario": {"instructions": {
            "domain": NAME,
            "reason_for_call": f"You want to buy a {item} from the shop.",
            "known_info": f"You want the {color} one.",
            "task_instructions": f"Ask for a {item}. Say which color only if you are asked. "
                                 "You do not want gift wrapping."}},
        "evaluation_criteria": {
            "actions": [{"action_id": f"{task_id}-look", "name": "list_products",
                         "arguments": {}},
                        {"action_id": f"{task_id}-order", "name": "place_order",
                         "arguments": {"sku": sku}}],
            "reward_basis": ["DB", "ACTION"]},
    })


TASKS = [_task("1", "blue", "mug", "MUG-BLUE"), _task("2", "red", "scarf", "SCARF-RED"),
         _task("3", "green", "mug", "MUG-GREEN"), _task("4", "grey", "scarf", "SCARF-GREY")]
SPLITS = {"base": ["1", "2", "3", "4"], "test": ["1", "2"], "train": ["3", "4"]}

DOMAIN = DomainPlugin(name=NAME, environment=environment, tasks=TASKS, splits=SPLITS)


def register() -> None:
    """Called by prour each time it reads a recipe naming this module under ``plugins``."""
    register_domain(DOMAIN)
