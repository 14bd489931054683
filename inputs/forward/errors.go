package forward

import "fmt"

func errSize(n, max int, limit string) error {
	return fmt.Errorf("message of at least %d bytes exceeds %s (%d)", n, limit, max)
}

func errIncomplete(have int, err error) error {
	return fmt.Errorf("message incomplete after %d bytes: %v", have, err)
}
