package forward

import "fmt"

func errSize(n, max int) error {
	return fmt.Errorf("message of at least %d bytes exceeds max_message_bytes (%d)", n, max)
}

func errIncomplete(have int, err error) error {
	return fmt.Errorf("message incomplete after %d bytes: %v", have, err)
}
