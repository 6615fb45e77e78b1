"""Every text the gsm8k task shows the model, in one place: the prompt's instruction and the feedback.

The task's built-in feedback (``task.gsm8k.feedback``) uses ``RETRY_MESSAGE`` / ``VERIFY_MESSAGE``
(``task.gsm8k.retry_message`` / ``verify_message`` override them); the interactions
(``task.gsm8k.interaction``) keep the texts of verl's own gsm8k interaction, ``INTERACTION_*``.
"""

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

RETRY_MESSAGE = (
    "Your answer is incorrect. Please reflect on your solution, find the mistake, and try again. "
    'Output the final answer after "####".'
)
VERIFY_MESSAGE = (
    "Are you sure? Can you write Python code to verify? "
    'Then output the final answer after "####".'
)

INTERACTION_RIGHT = "Your response is correct!"
INTERACTION_RETRY = "Your response is incorrect! You need to reflect on your answer and try again."
INTERACTION_VERIFY = "Are you sure? Can you write Python code to verify?"
INTERACTION_TERMINATE = "Thank you. Please output your final answer after \"####\"."
