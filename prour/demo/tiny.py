"""A tiny random-init Qwen3 with a locally trained BPE tokenizer, for tests and CPU demos.

Nothing is downloaded: the tokenizer is a byte-level BPE trained in about a second on a synthetic
customer-service corpus generated below, and the model is ``Qwen3ForCausalLM`` initialised from
a seed. The folder is a standard Hugging Face directory (config, safetensors, tokenizer.json,
tokenizer_config.json, chat_template.jinja, generation_config.json) that transformers and vLLM
load without custom code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

from prour.demo.folders import build_folder, save_quietly
from prour.files import write_atomic

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MARKER_FILE = "prour_tiny.json"
CHAT_TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")

# Qwen3's control tokens: the first three are special (dropped when decoding with
# skip_special_tokens); the tag tokens stay visible in decoded text, as in Qwen3.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TAG_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)

_FIRST = (
    "Mia",
    "Noah",
    "Yusuf",
    "Olivia",
    "Ethan",
    "Sofia",
    "Raj",
    "Amelia",
    "Lucas",
    "Chen",
    "Fatima",
    "Omar",
    "Isabella",
    "Ivan",
    "Aarav",
    "Emma",
    "Daiki",
    "Lei",
    "Juan",
    "Ava",
)
_LAST = (
    "Li",
    "Garcia",
    "Rossi",
    "Khan",
    "Smith",
    "Kovacs",
    "Nguyen",
    "Silva",
    "Brown",
    "Patel",
    "Moore",
    "Lopez",
    "Ahmed",
    "Ito",
    "Wilson",
    "Taylor",
    "Santos",
    "Muller",
    "Hernandez",
)
_CITIES = (
    "Houston",
    "Denver",
    "Seattle",
    "Chicago",
    "Boston",
    "Phoenix",
    "Austin",
    "Miami",
    "New York",
    "San Francisco",
    "Atlanta",
    "Portland",
)
_ITEMS = (
    "T-Shirt",
    "Water Bottle",
    "Hiking Boots",
    "Laptop",
    "Desk Lamp",
    "Backpack",
    "Wireless Earbuds",
    "Coffee Maker",
    "Office Chair",
    "Smart Watch",
    "Bookshelf",
    "Running Shoes",
    "Mechanical Keyboard",
    "Bluetooth Speaker",
    "Yoga Mat",
)
_OPTIONS = (
    '{"color": "blue", "size": "M"}',
    '{"capacity": "750ml", "material": "steel"}',
    '{"color": "black", "storage": "512GB"}',
    '{"size": "10", "material": "leather"}',
)
_TOOLS_RETAIL = (
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_order_details",
    "get_user_details",
    "get_product_details",
    "cancel_pending_order",
    "return_delivered_order_items",
    "exchange_delivered_order_items",
    "modify_pending_order_address",
    "modify_pending_order_payment",
    "calculate",
)
_TOOLS_AIRLINE = (
    "get_reservation_details",
    "search_direct_flight",
    "search_onestop_flight",
    "book_reservation",
    "cancel_reservation",
    "update_reservation_flights",
    "update_reservation_baggages",
    "send_certificate",
)
_TOOLS_TELECOM = (
    "get_customer_by_phone",
    "get_bills_for_customer",
    "suspend_line",
    "enable_roaming",
    "toggle_airplane_mode",
    "check_network_status",
    "reboot_device",
)
_USER_LINES = (
    "Hi, I want to return the {item} from order {order}.",
    "I need to cancel my order {order} because I ordered it by mistake.",
    "Can you change the shipping address of {order} to {street}, {city}?",
    "My email is {email}. I would like to exchange the {item} for a different size.",
    "I'm {first} {last} and my zip code is {zip}.",
    "My reservation {res} needs to move to a later flight from {city} to {city2}.",
    "How much would I get refunded if I return everything?",
    "My phone has no data since yesterday, the number is {phone}.",
    "Please use my gift card {payment} for the refund.",
    "Yes, please go ahead. Thank you!",
    "No, that's all. ###STOP###",
)
_AGENT_LINES = (
    "Sure, I can help with that. Could you tell me the email address on your account?",
    "I found your account, {first}. Which order would you like to change?",
    "Order {order} is pending; its total is ${price}. Shall I cancel it? (yes/no)",
    "The refund of ${price} will go back to {payment} in 5-7 business days.",
    "Your reservation {res} is in economy with {bags} checked bags.",
    "Before I continue, please confirm: return the {item} and refund to the original payment.",
    "I'm sorry, but the policy does not allow changing a delivered order's address.",
)
_QUESTIONS = (
    "Which color would you like for the new {item}?",
    "Do you want the refund to your original payment method or to a gift card?",
    "Which of your orders contains the {item}?",
    "What is the new address you want the order shipped to?",
    "Could you confirm the flight date you want to change to?",
)


def _ids(rng: random.Random) -> dict[str, str]:
    """Random ids, names and amounts in tau2's formats (orders #W1234567, user ids, emails)."""
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    return {
        "first": first,
        "last": last,
        "user": f"{first.lower()}_{last.lower()}_{rng.randint(1000, 9999)}",
        "email": f"{first.lower()}.{last.lower()}{rng.randint(1, 99)}@example.com",
        "order": f"#W{rng.randint(1000000, 9999999)}",
        "item_id": str(rng.randint(1000000000, 9999999999)),
        "res": "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(6)),
        "payment": rng.choice(("credit_card_", "gift_card_", "paypal_"))
        + str(rng.randint(100000, 9999999)),
        "phone": f"555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        "zip": str(rng.randint(10000, 99999)),
        "street": f"{rng.randint(1, 999)} {rng.choice(_LAST)} Street",
        "city": rng.choice(_CITIES),
        "city2": rng.choice(_CITIES),
        "item": rng.choice(_ITEMS),
        "price": f"{rng.randint(5, 2000)}.{rng.randint(0, 99):02d}",
        "bags": str(rng.randint(0, 3)),
    }


def _tool_call_text(rng: random.Random, v: dict[str, str]) -> str:
    """One tool call block with plausible arguments, and its JSON observation."""
    name = rng.choice(_TOOLS_RETAIL + _TOOLS_AIRLINE + _TOOLS_TELECOM)
    args = rng.choice(
        (
            {"order_id": v["order"]},
            {"user_id": v["user"]},
            {"email": v["email"]},
            {"reservation_id": v["res"], "cabin": "economy"},
            {"order_id": v["order"], "item_ids": [v["item_id"]], "payment_method_id": v["payment"]},
            {"phone_number": v["phone"]},
            {"expression": f"{v['price']} + {v['bags']} * 50"},
        )
    )
    call = json.dumps({"name": name, "arguments": args})
    observation = json.dumps(
        {
            "order_id": v["order"],
            "user_id": v["user"],
            "status": rng.choice(("pending", "delivered")),
            "items": [
                {
                    "name": v["item"],
                    "item_id": v["item_id"],
                    "price": float(v["price"]),
                    "options": json.loads(rng.choice(_OPTIONS)),
                }
            ],
        }
    )
    return f"<tool_call>\n{call}\n</tool_call>\n<tool_response>\n{observation}\n</tool_response>"


def _corpus(n_dialogues: int = 600, seed: int = 1234) -> list[str]:
    """Synthetic customer-service dialogues with tool calls, think blocks and query answers."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_dialogues):
        v = _ids(rng)
        parts = ["<|im_start|>user\n" + rng.choice(_USER_LINES).format(**v) + "<|im_end|>"]
        parts.append(
            "<think>\nThe user wants help with "
            + v["item"].lower()
            + "; I should look up "
            + v["order"]
            + " first.\n</think>"
        )
        parts.append(_tool_call_text(rng, v))
        parts.append(
            "<|im_start|>assistant\n" + rng.choice(_AGENT_LINES).format(**v) + "<|im_end|>"
        )
        question = rng.choice(_QUESTIONS).format(**v)
        parts.append(rng.choice(("NO", f"YES [QUESTION]{question}[/QUESTION]")))
        parts.append(
            json.dumps(
                {"tool": rng.choice(_TOOLS_RETAIL), "arguments": {"user_id": v["user"]}},
                separators=(",", ":"),
                sort_keys=True,
            )
        )
        docs.append("\n".join(parts))
    return docs


def _train_tokenizer(vocab_size: int) -> Any:
    """Byte-level BPE over the synthetic corpus, with Qwen3's control tokens as single tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return tok


def _fast_tokenizer(vocab_size: int, max_position: int) -> Any:
    """Wrap the BPE as a ``PreTrainedTokenizerFast`` with eos, pad and our chat template."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(vocab_size),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE_PATH.read_text(),
        model_max_length=max_position,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )


def _init_model(args: dict[str, Any], tokenizer: Any) -> Any:
    """Random-init ``Qwen3ForCausalLM`` (float32) from ``args['seed']``; global RNG untouched."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=args["hidden_size"],
        intermediate_size=3 * args["hidden_size"],
        num_hidden_layers=args["num_layers"],
        num_attention_heads=args["num_heads"],
        num_key_value_heads=args["num_kv_heads"],
        head_dim=args["head_dim"],
        max_position_embeddings=args["max_position"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args["seed"])
        model = Qwen3ForCausalLM(config)
    return model.to(torch.float32).eval()


def _generation_config(tokenizer: Any) -> Any:
    """End of turn or end of text stops generation; sampling settings are left to each request."""
    from transformers import GenerationConfig

    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    return GenerationConfig(
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def _tiny_args(seed: int, **kwargs: int) -> dict[str, Any]:
    """Everything that determines the built folder, as written to ``prour_tiny.json``."""
    return {
        "format_version": FORMAT_VERSION,
        "seed": seed,
        **kwargs,
        "chat_template_sha": hashlib.sha256(CHAT_TEMPLATE_PATH.read_bytes()).hexdigest()[:16],
    }


def build_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    vocab_size: int = 3000,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 32,
    max_position: int = 4096,
) -> Path:
    """Build (or reuse, when built with the same arguments) the tiny model folder; returns it."""
    out_dir = Path(out_dir).expanduser().resolve()
    args = _tiny_args(
        seed,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_position=max_position,
    )
    return build_folder(
        out_dir, MARKER_FILE, args, lambda folder: _write_tiny(folder, args), "tiny model"
    )


def _write_tiny(folder: Path, args: dict[str, Any]) -> None:
    """Train the tokenizer, init the model and save both (plus the marker) into ``folder``."""
    tokenizer = _fast_tokenizer(args["vocab_size"], args["max_position"])
    model = _init_model(args, tokenizer)
    model.generation_config = _generation_config(tokenizer)
    save_quietly(model, folder)
    tokenizer.save_pretrained(folder)
    _portable_tokenizer_class(folder / "tokenizer_config.json")
    write_atomic(folder / MARKER_FILE, json.dumps(args, indent=2, sort_keys=True) + "\n")
    logger.info("built tiny Qwen3 (vocab %d, seed %d) in %s", len(tokenizer), args["seed"], folder)


def _portable_tokenizer_class(config_path: Path) -> None:
    """Name the generic fast-tokenizer class, which transformers 4.x and 5.x (and vLLM) all load."""
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    write_atomic(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")


def default_tiny_path(seed: int = 0, **kwargs: int) -> Path:
    """Where the cached tiny model for these arguments lives ($PROUR_CACHE or ~/.cache/prour)."""
    args = _tiny_args(seed, **kwargs)
    digest = hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(os.environ.get("PROUR_CACHE") or Path.home() / ".cache" / "prour")
    return root / f"tiny-{digest}"


def default_tiny_dir(seed: int = 0, **kwargs: int) -> Path:
    """The shared cached tiny model for these arguments, built on first use."""
    return build_tiny_model(default_tiny_path(seed, **kwargs), seed, **kwargs)
