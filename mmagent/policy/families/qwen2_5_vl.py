"""Qwen2.5-VL (and Qwen2-VL): 28-pixel visual tokens, ChatML with a default system turn, time in M-RoPE.

* Visual tokens: 14-pixel patches merged 2x2, so one token per 28x28 pixels; videos in slabs of two frames.
* Chat template: ChatML; a conversation without a system turn gets ``You are a helpful assistant.``; each image
  or video is one ``<|vision_start|><|image_pad|><|vision_end|>`` placeholder the processor expands. The stock
  template drops images in ``tool``-role turns, so mmagent's observations are user turns wrapped in
  ``<tool_response>`` (what the template writes for a tool turn anyway).
* Time: there is no timestamp text; the video's frame rate sets the time axis of M-RoPE
  (``second_per_grid_ts``), so the processor is given the clip's sampling rate. Frames that tools return are
  images, named with their times in the observation text (``obs:3 (12.50s)``).
"""

from __future__ import annotations

from typing import Any

from mmagent.policy.families.base import Family, register

#: ChatML with Qwen2-VL's vision placeholders; the same shape as the hub template of Qwen2.5-VL.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Qwen25VL(Family):
    def chat_template(self) -> str:
        return CHAT_TEMPLATE

    def build_processor(self, tokenizer: Any, min_pixels: int, max_pixels: int) -> Any:
        from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

        return Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels),
                                   tokenizer=tokenizer, chat_template=CHAT_TEMPLATE,
                                   video_processor=Qwen2VLVideoProcessor(min_pixels=min_pixels, max_pixels=max_pixels))

    def tiny_config(self, tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, vision_width: int = 32,
                    vision_depth: int = 2) -> Any:
        from transformers import Qwen2_5_VLConfig

        ids = tokenizer.convert_tokens_to_ids
        head_dim = hidden_size // 4
        section = [head_dim // 8, (head_dim // 2 - head_dim // 8) // 2]
        section.append(head_dim // 2 - sum(section))
        return Qwen2_5_VLConfig(
            text_config={
                "vocab_size": len(tokenizer), "hidden_size": hidden_size, "intermediate_size": hidden_size * 2,
                "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                      "mrope_section": section},
                "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
                "pad_token_id": ids("<|endoftext|>"),
            },
            vision_config={"depth": vision_depth, "hidden_size": vision_width, "intermediate_size": 2 * vision_width,
                           "num_heads": max(2, vision_width // 16), "out_hidden_size": hidden_size,
                           "fullatt_block_indexes": [vision_depth - 1], "window_size": 112,
                           "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
            tie_word_embeddings=False,
        )

    def model_class(self) -> Any:
        from transformers import Qwen2_5_VLForConditionalGeneration

        return Qwen2_5_VLForConditionalGeneration


QWEN2_5_VL = register(Qwen25VL(name="qwen2_5_vl", label="Qwen2.5-VL", model_types=("qwen2_5_vl", "qwen2_vl"),
                               example_id="Qwen/Qwen2.5-VL-7B-Instruct", patch_factor=28,
                               default_system="You are a helpful assistant.",
                               name_hints=("qwen2.5-vl", "qwen2_5_vl", "qwen2-vl", "qwen2_vl")))
