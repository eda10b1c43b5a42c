"""Qwen3-VL, dense and MoE: 32-pixel visual tokens, no default system turn, textual timestamps between frames.

* Visual tokens: 16-pixel patches merged 2x2, so one token per 32x32 pixels; videos in slabs of two frames.
  The vision tower feeds three of its layers into the first decoder layers (DeepStack); the transformers
  backend needs nothing for that beyond giving each forward its own pixels.
* Chat template (the hub's, e.g. ``Qwen/Qwen3-VL-8B-Instruct``): ChatML; no system turn unless the
  conversation has one; a ``tool`` turn is written as a user turn ``<tool_response>\\n...\\n</tool_response>``
  *with* its images and videos, which is exactly the user turn mmagent renders for an observation. Tool calls are
  Hermes JSON inside ``<tool_call>`` (as for Qwen2.5-VL); mmagent's own system prompt lists the tools.
* Time: Qwen3-VL reads time from text, not from M-RoPE. Its processor writes ``<t seconds>`` before each slab
  of a video (``t``: the mean time of the slab's two frames), computed as ``frames_indices / fps`` from the
  video metadata. mmagent passes the frames' real times as the indices with ``fps=1``, so the first look at a
  video carries the times its frames were really taken at (not a uniform guess). Frames that tools return
  are images; each is preceded by its real time written the same way (``<12.5 seconds>``), right before
  its vision block, as the model sees a video frame.
"""

from __future__ import annotations

from typing import Any, Sequence

from mmagent.policy.families.base import Family, register, seconds_text

#: (Literal newlines right after a block tag are written as expressions: transformers renders templates with
#: ``trim_blocks``, which drops them.)
#: The hub template's output for the messages mmagent writes (system string, user and tool turns with text,
#: image and video parts, assistant text), in the same shape; tools are listed by mmagent's system prompt.
CHAT_TEMPLATE = (
    "{% if messages[0].role == 'system' %}<|im_start|>system\n"
    "{% if messages[0].content is string %}{{ messages[0].content }}"
    "{% else %}{% for c in messages[0].content %}{% if 'text' in c %}{{ c.text }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endif %}"
    "{% macro render(content) %}"
    "{% if content is string %}{{ content }}"
    "{% else %}{% for c in content %}"
    "{% if c.type == 'image' or 'image' in c or 'image_url' in c %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c.type == 'video' or 'video' in c %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in c %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endmacro %}"
    "{% for message in messages %}"
    "{% if message.role == 'user' or message.role == 'assistant' %}"
    "<|im_start|>{{ message.role }}\n{{ render(message.content) }}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\\n<tool_response>\\n' }}{{ render(message.content) }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class Qwen3VL(Family):
    def frame_time_text(self, seconds: float) -> str:
        return seconds_text(seconds)

    def video_metadata(self, times: Sequence[float], fps: float) -> dict[str, Any]:
        # The processor writes frames_indices / fps: real times over fps=1 are the times themselves.
        return {"fps": 1.0, "frames_indices": [float(t) for t in times]}

    def vllm_video(self, frames: Any, times: Sequence[float], fps: float) -> tuple[Any, dict[str, Any]]:
        # vLLM's Qwen3-VL takes (frames, metadata) and writes the timestamps from the metadata; frames are
        # already sampled, so it must not sample again.
        meta = {"fps": 1.0, "frames_indices": [float(t) for t in times], "total_num_frames": len(times),
                "duration": float(times[-1]) if times else 0.0, "video_backend": "mmagent"}
        return (frames, meta), {"do_sample_frames": False}

    def chat_template(self) -> str:
        return CHAT_TEMPLATE

    def build_processor(self, tokenizer: Any, min_pixels: int, max_pixels: int) -> Any:
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        image = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=16,
                                      image_mean=[0.5] * 3, image_std=[0.5] * 3)
        video = Qwen3VLVideoProcessor(size={"shortest_edge": min_pixels, "longest_edge": max_pixels * 64},
                                      patch_size=16, image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                                chat_template=CHAT_TEMPLATE)

    def tiny_config(self, tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, vision_width: int = 32,
                    vision_depth: int = 2) -> Any:
        from transformers import Qwen3VLConfig

        ids = tokenizer.convert_tokens_to_ids
        head_dim = hidden_size // 4
        section = [head_dim // 4, (head_dim // 2 - head_dim // 4) // 2]
        section.append(head_dim // 2 - sum(section))
        return Qwen3VLConfig(
            text_config={
                "vocab_size": len(tokenizer), "hidden_size": hidden_size, "intermediate_size": hidden_size * 2,
                "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": head_dim, "max_position_embeddings": 4096,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section,
                                    "mrope_interleaved": True},
                "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
                "pad_token_id": ids("<|endoftext|>"),
            },
            vision_config={"depth": vision_depth, "hidden_size": vision_width, "intermediate_size": 2 * vision_width,
                           "num_heads": max(2, vision_width // 16), "out_hidden_size": hidden_size,
                           "deepstack_visual_indexes": list(range(min(vision_depth, num_layers))),
                           "num_position_embeddings": 64, "patch_size": 16, "spatial_merge_size": 2,
                           "temporal_patch_size": 2},
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
            tie_word_embeddings=False,
        )

    def model_class(self) -> Any:
        from transformers import Qwen3VLForConditionalGeneration

        return Qwen3VLForConditionalGeneration


QWEN3_VL = register(Qwen3VL(name="qwen3_vl", label="Qwen3-VL", model_types=("qwen3_vl", "qwen3_vl_moe"),
                            example_id="Qwen/Qwen3-VL-8B-Instruct", patch_factor=32, default_system=None,
                            name_hints=("qwen3-vl", "qwen3_vl")))
